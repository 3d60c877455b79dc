"""The site's colours, in one place: the pictures match the theme (mkdocs-material's indigo accent) and each other."""

INDIGO = "#3f51b5"  # the theme's accent: live tensors, the path the workflow takes
INDIGO_LIGHT = "#c5cae9"  # the allocator's cache, behind what it serves
INDIGO_PALE = "#e8eaf6"
INDIGO_EDGE = "#9fa8da"
RED = "#c62828"  # a budget, an out-of-memory error
AMBER = "#ef6c00"  # a warning: what the restart policy said
TEAL = "#00897b"
PURPLE = "#7e57c2"
GREY = "#9e9e9e"
BROWN = "#8d6e63"
