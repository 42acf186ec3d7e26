"""The red-team suite: the seed's config and our case library, the attacks, and how a reply is judged."""
