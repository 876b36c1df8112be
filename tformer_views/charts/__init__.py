"""Vega-Lite chart specifications and their export to SVG / PNG."""
