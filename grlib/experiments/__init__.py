"""One module per notebook: the whole logic of each pipeline stage, callable from tests.

Importing the package makes the charts its modules build render offline in notebooks (PNG by
vl-convert, no CDN: grlib.plots.use_offline_renderer)."""
from grlib.plots import use_offline_renderer

use_offline_renderer()
