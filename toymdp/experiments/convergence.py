"""Experiment module: being written."""
