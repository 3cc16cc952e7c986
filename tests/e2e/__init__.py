"""Real-browser end-to-end tests: JupyterLab and Notebook 7 driven by Debian's chromium."""
