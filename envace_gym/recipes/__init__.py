"""End-to-end runs behind the ``envace`` commands, built from the stages below: ``train``, ``experiment``,
``eval``, ``demo`` and ``bench`` (one module each; import the one you need).
"""
