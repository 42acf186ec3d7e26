"""Tools for developers and demos: the embedded broker, synthetic traffic, the demo, the rules generator."""
