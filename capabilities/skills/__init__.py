"""Skills: Markdown instructions with YAML front matter, run as sub-runs (see README "Skills")."""
