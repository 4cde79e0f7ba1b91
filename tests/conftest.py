pytest_plugins = ["tests.infra.fixtures"]
