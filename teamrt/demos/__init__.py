"""Demos, runnable offline: `teamrt demo NAME`."""
