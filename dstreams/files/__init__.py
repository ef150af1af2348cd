"""The files connector: folders and object stores (local paths, ``s3://``), in one place.

* :mod:`.source`: ``textFileStream`` and ``binaryRecordsStream`` (new files of a folder, each batch's
  file list fixed when the batch is generated and kept in the metadata log);
* :mod:`.sink`: ``saveAsTextFiles`` and ``saveToStore``, exactly once (staged, then committed by a
  ``_SUCCESS`` marker after the fence check).

The connector layer sits above the streaming model and recovery and below the API (tests/unit/test_layers.py).
"""
