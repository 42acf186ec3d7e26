"""The fairness audit: a predictions dataset and the seed's config in, per-comparison results and a verdict out;
the seed-style metric API, the bias auditor and the NYC LL144 table over the same counts."""
