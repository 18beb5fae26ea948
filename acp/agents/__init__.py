"""Built-in ACP agents. ``scripted`` is the reference agent every test can rely on."""
