"""Tests of what one backend alone does, in one subfolder per backend; what every backend must do goes in contract, conformance or properties."""
