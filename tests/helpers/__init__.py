"""Helpers shared by the tests, one module per job (tests/conftest.py puts tests/ on sys.path; import the module
you need, e.g. `from helpers.cli import provision`):

- `helpers.cli`: the `provision` command as a subprocess (`provision()`, `provision_argv()`, `REPO`), and what a
  command changed: `tree_listing()`, `edit_yaml()` / `set_key()` for one value of an inventory file.
- `helpers.parse_fixtures`: the parse fixtures (`FIXTURES`, `expected()`, `cases()`, `fixture_names()`, `read()`,
  `check()`).
- `helpers.modules`: Ansible modules run in-process (`run_module()` with a table of expected commands, `ok()`,
  `fail()`, `run_module_real()`, `AnsibleExitJson` / `AnsibleFailJson`), in the style of community.general's module
  tests, and `local_playbook()` (tasks through real ansible-playbook on localhost).
- `helpers.lab_host`: the lab as a test drives it: `LAB_MARKS` (root only, marker `lab`), `LabHost`, `leftovers()`.
- `helpers.report`: what a person reads: the lab run history `provision report` pages are built from
  (`REPORT_HISTORY`, `lab_report_history()`), `html_elements()` of a page, `leaves()` of a figure.
- `helpers.browser`: a real headless browser (Debian's chromium) with the network off: `chromium()`, `browse()`,
  `page_dom()`.
- `helpers.prometheus`: Debian's promtool (`promtool()`, fetched once when missing; `run()`), the metric names a
  PromQL expression reads (`metric_names()`) and those a health run's textfile declares (`health_names()`), the
  samples of a text-format page (`series()`, `families()`).
- `helpers.collection`: the collection as users get it: `build()` (ansible-galaxy), `install()` into a clean path,
  `isolated_env()` (only that path on Ansible's collection paths), `ansible_core()` (a release in a cached venv of
  its own: `LOWEST`, `NEWEST`), `requirements()` the tarball declares.

No test module imports another test module; what two of them share lives here or in a conftest.py.
"""
