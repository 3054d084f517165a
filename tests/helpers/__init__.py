"""What several test files share and is not a fixture (fixtures stay in tests/conftest.py).

- repo.py: the checkout's root and the spec's case files;
- arithmetic.py: the same floating-point arithmetic on every CI machine, and its fingerprint;
- cli.py: `is-study ARGS` run in-process, and a sweep killed at its first finished job;
- figure_checks.py: geometry checks of a drawn figure (clipped text, overlaps, tick labels);
- naive_corrections.py: a naive scalar restatement of the preset table, for golden values;
- audit_targets.py, external_loss_planted_bug.py: external policy losses for `is-study audit --target`
  (named by module, `tests.helpers.NAME:ATTR`, or by path, `tests/helpers/NAME.py:ATTR`);
- only_own_dependencies.py: a script, `is-study ARGS` with only is-study's own dependencies importable.
"""
