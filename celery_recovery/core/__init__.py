"""The bottom layer: states, errors, settings and their presets, typed records.

Nothing here imports from the rest of the package; every other layer may import it.
"""
