"""``tracker ui``: a read-only web view of the experiment index.

- ``command``: the ``ui`` sub-command (its options, start-up checks, signals); standard library only at import.
- ``server``: the HTTP server (``http.server`` with a thread per request): GET and HEAD only, the Host check against
  DNS rebinding, the security headers (a Content-Security-Policy that allows no script at all), routing.
- ``pages``: the HTML pages: the runs table with the filters of ``tracker runs`` (stuck runs first) and a run's page.
- ``timeline``: a run's timeline as SVG, drawn as ``tracker show`` draws it in the terminal (``tracker.read.timeline``).
- ``style``: the one stylesheet, served as ``/static/ui.css`` (no inline style: the policy forbids it).

Everything is read through the read side (``tracker.read``: one ``IndexReader`` per request, which opens the index
with ``mode=ro``: nothing here can write to it), and the query string's filters are read by
``tracker.read.filters.run_filter``, as ``tracker runs`` reads its options. Every value from the index is escaped.
"""
