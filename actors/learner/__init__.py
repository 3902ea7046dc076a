"""The `learner` actor kind (its config model lives in `actors.learner._config`)."""
