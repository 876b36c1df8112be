"""The Streamlit side the pages share: caches, URL state, downloads, shared widgets and panels.

The only Streamlit code besides app.py and app_pages/ (a test checks).
"""
