"""Reports of every gate: HTML, JUnit XML and Markdown, filed where the team keeps them, and e-mail on critical
failures."""
