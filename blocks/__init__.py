"""Pipeline families written with the modular framework, one subpackage per family."""
