# Shortcuts for the scripts in scripts/ (which are what the README and CI use).
.PHONY: setup serve test bench lint

setup:
	scripts/bootstrap.sh test

serve:
	scripts/serve.sh

test:
	scripts/test.sh

bench:
	scripts/bench.sh

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .
