"""The views and the widgets they share."""
