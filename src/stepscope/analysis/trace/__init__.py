"""Analyses of the event table: step breakdown, overlap, op ranking, trace diff."""
