"""Payload logs: the records serving platforms already write (KServe CloudEvents, Seldon Core v2) read as the halves
of calls (the platforms' wire formats, their tensors read a poll at a time), joined by call id, and made the rows our
own events would be."""
