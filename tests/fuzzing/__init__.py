"""Fuzzing and property testing of the gate (``matcher.auth.gate.judge``).

- ``choosers``: the tiny interface the generator draws from, with adapters for
  hypothesis, ``random.Random`` and atheris' ``FuzzedDataProvider``;
- ``records``: the one structure-aware generator of (key, headers, value) records;
- ``target``: ``check_record``, the gate and the quarantine row with their invariants;
- ``campaign``: the long run (``python -m tests.fuzzing.campaign --inputs N``).
"""
