from dagrunner.cli.main import entry

entry()
