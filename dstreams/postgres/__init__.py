"""The PostgreSQL connector: ``saveToPostgres``, exactly once (:mod:`.sink`: staging table, a commit transaction that
moves the batch's rows and records the batch, the epoch fence row, the claim at start).

The connector layer sits above the streaming model and recovery and below the API (tests/unit/test_layers.py).
"""
