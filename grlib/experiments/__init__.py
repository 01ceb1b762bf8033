"""One module per notebook: the whole logic of each pipeline stage, callable from tests (a stage
whose launched ranks run a program of their own keeps it in a module beside it: sparse_measured).

Importing the package makes the charts its modules build render offline in notebooks (PNG by
vl-convert, no CDN: grlib.plots.use_offline_renderer)."""
from grlib.plots import use_offline_renderer

use_offline_renderer()
