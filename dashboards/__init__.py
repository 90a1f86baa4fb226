"""l9gpu's Grafana dashboards as code: generate.py writes the JSON files next to it."""
