"""Renderers: turn a Report into text, JSON, HTML or TensorBoard events. They never measure."""
