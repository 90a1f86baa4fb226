"""``python -m exporter`` runs the same CLI as the ``l9gpu`` console script."""

from exporter.app.cli import main

raise SystemExit(main())
