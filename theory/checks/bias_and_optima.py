"""Checkers: being written."""
