"""The study report (a static HTML page) and the plots it shares with the dashboard."""
