# KV-cache course kit. `make grade` and `make test` set everything up themselves.
#
#   make grade [SUBMISSION=dir]   grade a submission (default: the reference solution)
#   make test                     the project's own test suite (no slow benchmarks)
#   make lint                     ruff lint + format check
#   make regen / make check-cases regenerate test cases / verify they match solution/
#   make dist                     build dist/autograder.zip (Gradescope) and dist/student.zip
#   make bench                    every benchmark below, then the slow tests (about 1.5 h)
#   make calibrate                time the benchmark checks, propose thresholds (DEVICE=cpu|cuda)
#   make stability                50 graded runs: do benchmark verdicts hold on a busy machine?
#                                 (DEVICE=cuda judges the cuda profile)
#   make mbu                      reference Llama decode vs memory bandwidth and transformers
#   make budget                   time and memory of a whole grading run (also at 1/2 CPU)

# The system interpreter is preferred: the sandboxed worker runs as an
# unprivileged user, who must be able to execute the venv's interpreter
# (a pyenv under /root is not readable by that user).
PYTHON     ?= $(firstword $(wildcard /usr/bin/python3) python3)
VENV       ?= .venv
PY         := $(VENV)/bin/python
SUBMISSION ?= solution
RESULTS    ?= results/results.json
PARTS      ?=
PYTEST_ARGS ?=
DEVICE     ?= auto
RUNS       ?= 50

STAMP := $(VENV)/.installed

.PHONY: grade test lint format regen check-cases venv clean dist bench calibrate stability mbu budget slow-tests

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and exactly pinned: the CPU wheel, never the CUDA packages.
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

grade: $(STAMP)
	$(PY) -m grader grade $(SUBMISSION) --results $(RESULTS) $(if $(PARTS),--parts $(PARTS),) --table

# pytest exits 5 when it collected no tests: that is a failure, not a pass.
test: $(STAMP)
	@$(PY) -m pytest -m "not slow" -q $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$status

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

regen: $(STAMP)
	$(PY) -m grader regen

check-cases: $(STAMP)
	$(PY) -m grader regen --check

dist: $(STAMP)
	$(PY) -m grader build autograder --out dist/autograder.zip
	$(PY) -m grader build student --out dist/student.zip

bench: calibrate stability mbu budget slow-tests

calibrate: $(STAMP)
	$(PY) -m grader calibrate --device $(DEVICE) --json results/calibration.json

stability: $(STAMP)
	$(PY) benchmarks/verdict_stability.py --runs $(RUNS) --device $(if $(filter cuda,$(DEVICE)),cuda,cpu) --out results/stability.json

mbu: $(STAMP)
	$(PY) benchmarks/reference_mbu.py --dtype float32 --out results/mbu_float32.json
	$(PY) benchmarks/reference_mbu.py --dtype bfloat16 --out results/mbu_bfloat16.json

budget: $(STAMP)
	$(PY) benchmarks/grading_budget.py
	$(PY) benchmarks/grading_budget.py --half-cpu

slow-tests: $(STAMP)
	@$(PY) -m pytest -m slow -q $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no slow tests" >&2; exit 1; fi; exit $$status

clean:
	rm -rf $(VENV) results dist .pytest_cache .ruff_cache
