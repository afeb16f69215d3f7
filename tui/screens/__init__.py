"""Modal screens: steering forms, confirmation, the steering menu and one plan in full."""
