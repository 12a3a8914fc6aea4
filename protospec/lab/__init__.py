"""Tools for the notebooks: the draft-loop debugger, plots and analysis of acceptance."""
