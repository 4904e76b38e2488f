"""Seeing attention: matplotlib heatmaps and a self-contained HTML viewer.

- :func:`plot_alignment`, :func:`plot_heads`: heatmaps (PNG, SVG, PDF); need the ``viz``
  extra (``pip install 'qkv[viz]'``).
- :func:`show`, :func:`save_html`: one HTML file with head, model and matrix views; no
  network, no extra dependency.
- :func:`summary`: one line per layer naming its most focused head and where it looks.
- :func:`save_alignments`: the cross-attention of translated sentences, one page with a
  sentence selector (or one image per sentence); :func:`save_translations` adds every
  layer and head of a Transformer translator (cross, encoder and decoder attention).

Maps are ``(L, H, Tq, Tk)`` tensors or arrays (layers x heads x queries x keys) or a list
of ``L`` arrays ``(H, Tq, Tk)``; give ``tokens`` for self-attention, or ``src_tokens``
(keys) and ``tgt_tokens`` (queries) for cross-attention.
"""

from qkv.viz.alignments import save_alignments
from qkv.viz.heatmap import plot_alignment, plot_heads
from qkv.viz.html import AttentionView, render_html, save_html, show
from qkv.viz.maps import as_maps, head_entropy, summary
from qkv.viz.translations import save_translations

__all__ = [
    "AttentionView",
    "as_maps",
    "head_entropy",
    "plot_alignment",
    "plot_heads",
    "render_html",
    "save_alignments",
    "save_html",
    "save_translations",
    "show",
    "summary",
]
