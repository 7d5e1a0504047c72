pytest_plugins = ["tests.harness.cluster_fixtures"]
