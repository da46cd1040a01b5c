"""DataLens (Wang et al., CCS 2021): a teacher-discriminator ensemble voting on the
student generator's gradient through TopAgg, and its ablations and aggregators."""
