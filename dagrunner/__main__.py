from dagrunner.cli import entry

entry()
