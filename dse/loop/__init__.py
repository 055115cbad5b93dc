"""The study loop: the controller and its parts.

Owns: ``study`` (``StudyRunner``, the controller), ``verify`` (``dse verify``'s long runs),
``agent_session`` (asks and tells the agent), ``dispatch`` (starts one trial on the runner:
its folder, spec and ``running`` row), ``reconcile`` (after a crash), ``loss_guard`` (the
loss against the baseline's), ``proposer`` (rules, cost-model pre-screen and duplicates),
``context`` (``StudyContext``, what every part shares)."""
