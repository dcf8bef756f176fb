"""Example integrator apps, shown in docs/integrating.md. Not part of the shipped package (pyproject)."""
