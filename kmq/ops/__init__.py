"""Read-only operations shared by the CLI and the console: status, dead-letter
listing and replay, trace reading, audit and access (ACL) reports.

They read the markers, queue and DLQ topics through the client layer; none of
them is part of the tracker service.
"""
