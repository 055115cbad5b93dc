"""The study loop: the proposer and its agent session, the launch of a trial, reconciliation
after a crash, the loss guard and the controller (:mod:`dse.loop.study`)."""
