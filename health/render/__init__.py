"""Presenting a report, one module per presentation: ``document`` (the health+json
document), ``table`` (``status``'s text table), ``page`` (the HTML status page) and its
``chart`` (inline SVG); ``words``, the values in text they share."""
