"""The trajectory viewer: ``python -m rollout view OUTPUT_DIR [--port N] [--host H] [--compare OTHER_DIR]``.

A local web page over a run's output folder (the journal and the sample files, also while the run
is still going): the episode table, one episode as a conversation and as tokens coloured by loss
mask, the summary, the GRPO example's train log, and two runs side by side. See docs/viewer.md.

* :mod:`rollout.app.viewer.tail`: reading JSONL files as they grow (byte offsets);
* :mod:`rollout.app.viewer.data`: :class:`RunIndex`, the episodes and files of one run;
* :mod:`rollout.app.viewer.tokens`: the token view, decoded with the run's tokenizer;
* :mod:`rollout.app.viewer.compare`: two runs by task;
* :mod:`rollout.app.viewer.server`: the aiohttp server and its JSON API; the page is ``static/``.
"""

from rollout.app.viewer.data import NotARunError, RunIndex, check_run_dir
from rollout.app.viewer.server import Viewer, bind_socket, is_loopback, make_app, serve

__all__ = ["NotARunError", "RunIndex", "Viewer", "bind_socket", "check_run_dir", "is_loopback", "make_app", "serve"]
