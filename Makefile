# KV-cache course kit. `make grade` and `make test` set everything up themselves.
#
#   make help                     this list (also what a bare `make` prints)
#   make grade [SUBMISSION=dir]   grade a submission (default: the reference solution)
#   make test                     the project's own test suite (no slow benchmarks)
#   make mutant-tests             the suite's mutation runs: every library mistake graded, and the isolation's
#   make attack-tests             hostile designs graded for every part, with and without cgroups
#   make lint                     ruff lint + format check, import-linter's layer contracts
#   make lock                     regenerate requirements/{image,dev}.txt with uv (TORCH_WHEELS=dir: local wheels)
#   make regen / make check-cases regenerate test cases / verify they match solution/
#   make dist                     build dist/autograder.zip (Gradescope) and dist/student.zip
#   make run-local [SUBMISSION=dir]  the autograder zip run exactly as Gradescope runs it
#   make mutants [PARTS=part2]    how many known mistakes the grader catches and names
#   make mutation [PARTS=part1 JOBS=2 NICE=10]  cosmic-ray's mutants of solution/ graded (on a
#                                 scratch copy); scores, survivors, triage (docs/mutation/)
#   make batch EXPORT=dir [OUT=regrade JOBS=2 REGRADE=1]  regrade a Gradescope export
#                                 (REGRADE=1: grade again what OUT already holds)
#   make bench                    every benchmark below, then the slow tests (about 1.5 h)
#   make calibrate                time the benchmark checks, propose thresholds (DEVICE=cpu|cuda)
#   make stability                50 graded runs: do benchmark verdicts hold on a busy machine?
#                                 (DEVICE=cuda judges the cuda profile)
#   make mbu                      reference Llama decode vs memory bandwidth and transformers
#   make budget                   time and memory of a whole grading run (also at 1/2 CPU,
#                                 and with a shared fork server, as a class regrade grades)
#   make throughput [JOBS=2]      submissions a minute of a class regrade (20, every part)
#   make slurm-tests              start a single-node Slurm here (root, apt), grade through it
#   make browser                  headless Chromium for the rendered-page tests (root, apt)
#   make format / make clean      ruff's formatting applied / the venv and build outputs removed

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
# pytest-xdist workers: one per core and one more, which runs while the others wait on
# subprocesses, timeouts and the package index (2 cores: the suite kept them 75 % busy
# with two workers, 91 % with three).
TEST_JOBS  ?= $(shell echo $$(( $$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1) + 1 )))
DEVICE     ?= auto
RUNS       ?= 50
# What make stability grades besides the reference and the disguised cache-free design.
STABILITY  ?= --partial-caches --variants
EXPORT     ?=
REGRADE    ?=
OUT        ?= regrade
JOBS       ?= 2
KVGRADER   := $(VENV)/bin/kvgrader

STAMP := $(VENV)/.installed

# The locks: exact versions of everything, for the image's Python and platform.
IMAGE_LOCK := requirements/image.txt
DEV_LOCK   := requirements/dev.txt
# CPU-only torch comes from PyTorch's CPU index (or a folder of local wheels).
TORCH_INDEX  ?= https://download.pytorch.org/whl/cpu
TORCH_WHEELS ?=
LOCK_TARGET  := --python-version 3.11 --python-platform x86_64-manylinux_2_35 --custom-compile-command "make lock"
LOCK_SOURCES := $(if $(TORCH_WHEELS),--find-links $(TORCH_WHEELS),--extra-index-url $(TORCH_INDEX) --index-strategy unsafe-best-match)

.DEFAULT_GOAL := help

# The header comment above, without its `# ` (each target with its one line).
help:
	@sed -n '1,/^$$/{s/^# \{0,1\}//p}' $(firstword $(MAKEFILE_LIST))

.PHONY: help grade test lint format regen check-cases venv clean dist bench calibrate stability mbu budget slow-tests lock \
	run-local mutants mutation batch slurm-tests mutant-tests attack-tests throughput browser

venv: $(STAMP)

# The same installation steps as the Gradescope image (grader/gradescope/setup.sh):
# torch alone from the CPU index, then every package at its locked version.
$(STAMP): $(DEV_LOCK) pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-deps --retries 2 --index-url $(TORCH_INDEX) "$$(grep '^torch==' $(DEV_LOCK))"
	$(PY) -m pip install --quiet -r $(DEV_LOCK)
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

lock: $(STAMP)
	$(VENV)/bin/uv pip compile pyproject.toml $(LOCK_TARGET) $(LOCK_SOURCES) -o $(IMAGE_LOCK)
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --extra gpu --extra cluster --extra similarity -c $(IMAGE_LOCK) $(LOCK_TARGET) $(LOCK_SOURCES) -o $(DEV_LOCK)

grade: $(STAMP)
	$(PY) -m grader grade $(SUBMISSION) --results $(RESULTS) $(if $(PARTS),--parts $(PARTS),) --table

# Headless Chromium for tests/ta/regrade/test_rendered_pages.py, from the system's packages
# (Debian's chromium-headless-shell, as root with apt); where none can be installed, those
# tests skip and say why. The Gradescope image never needs it.
BROWSERS := chromium-headless-shell chromium chromium-browser google-chrome
browser:
	@for b in $(BROWSERS); do command -v $$b >/dev/null && exit 0; done; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	  chromium-headless-shell; then exit 0; fi; \
	echo "no headless Chromium ($(BROWSERS)): the rendered-page tests will skip" >&2

# pytest exits 5 when it collected no tests: that is a failure, not a pass.
# One torch thread per test process: pytest-xdist already runs a worker per core, and more
# threads than cores spin against each other (the graded workers use one too).
# Bytecode is cached even where the shell says not to (PYTHONDONTWRITEBYTECODE): every
# grader, fork server and test worker the suite starts would compile the kit's modules,
# and pytest rewrite every test module, again.
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=
# TEST_JOBS pytest-xdist workers (default: cores + 1; 0: no workers); modules with
# expensive fixtures stay on one worker (--dist loadgroup, their xdist_group mark).
test: $(STAMP) | browser
	@$(TEST_ENV) $(PY) -m pytest -m "not slow and not slurm and not mutants and not attacks and not isolation" -q -n $(TEST_JOBS) --dist loadgroup $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$status

# The mutation runs of the suite: every library mistake caught and named, every correct
# variant at full marks, every triaged survivor losing its check's points.
mutant-tests: $(STAMP)
	@$(TEST_ENV) $(PY) -m pytest -m "mutants or isolation" -q -n $(TEST_JOBS) --dist loadgroup $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no mutant tests" >&2; exit 1; fi; exit $$status

# Hostile designs graded again for every part and both CPU accountings (cgroup, process
# tree), those slowed or padded on purpose and the partial caches at other periods: each
# must lose its benchmark points.
attack-tests: $(STAMP)
	@$(TEST_ENV) $(PY) -m pytest -m attacks -q -n $(TEST_JOBS) --dist loadgroup $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no attack tests" >&2; exit 1; fi; exit $$status

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

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

run-local: $(STAMP)
	$(KVGRADER) run-local $(SUBMISSION) --details

mutants: $(STAMP)
	$(KVGRADER) mutants $(if $(PARTS),--parts $(PARTS),)

# The engine mutates a scratch copy under results/mutation/, never solution/ itself.
NICE ?= 10
mutation: $(STAMP)
	$(PY) -m grader.ta.mutation run $(if $(PARTS),--parts $(PARTS),) --jobs $(JOBS) --nice $(NICE)

batch: $(STAMP)
	@test -n "$(EXPORT)" || { echo "usage: make batch EXPORT=dir [OUT=regrade JOBS=2 REGRADE=1]" >&2; exit 2; }
	$(KVGRADER) batch $(EXPORT) --out $(OUT) --jobs $(JOBS) $(if $(PARTS),--parts $(PARTS),) $(if $(REGRADE),--regrade,)

bench: calibrate stability mbu budget throughput slow-tests

calibrate: $(STAMP)
	$(PY) -m grader calibrate --device $(DEVICE) --json results/calibration.json

stability: $(STAMP)
	$(PY) benchmarks/verdict_stability.py --runs $(RUNS) $(STABILITY) --device $(if $(filter cuda,$(DEVICE)),cuda,cpu) --out results/stability.json

mbu: $(STAMP)
	$(PY) benchmarks/reference_mbu.py --dtype float32 --out results/mbu_float32.json
	$(PY) benchmarks/reference_mbu.py --dtype bfloat16 --out results/mbu_bfloat16.json

budget: $(STAMP)
	$(PY) benchmarks/grading_budget.py
	$(PY) benchmarks/grading_budget.py --half-cpu
	$(PY) benchmarks/grading_budget.py --poll-ms 0 --shared

throughput: $(STAMP)
	$(PY) benchmarks/regrade_throughput.py --jobs $(JOBS)

slow-tests: $(STAMP)
	@$(PY) -m pytest -m slow -q $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no slow tests" >&2; exit 1; fi; exit $$status

# A single-node Slurm on this machine (root, apt: slurm-wlm, munge), then the tests that
# grade through it.
slurm-tests: $(STAMP)
	sh tests/ta/regrade/local_slurm.sh
	@$(PY) -m pytest -m slurm -q $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no slurm tests" >&2; exit 1; fi; exit $$status

clean:
	rm -rf $(VENV) .image-venv results dist .pytest_cache .ruff_cache
