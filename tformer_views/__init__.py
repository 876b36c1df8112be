"""What the pages show, computed from the core's traces: numbers, tables, pictures and Vega-Lite charts.

No Streamlit here (a test checks): a notebook can build every view the app draws.
"""
