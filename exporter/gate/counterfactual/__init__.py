"""The counterfactual gate for decisions made by language models: the same item asked once per group value, the
decision read by an extractor, paired tests per pair of groups, the seed's metrics and the LL144 table."""
