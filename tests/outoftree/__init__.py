"""A backend built outside the package as a third party would write one, registered only through NJ_TEST_BACKENDS: the proof that a new backend needs no edit to any suite."""
