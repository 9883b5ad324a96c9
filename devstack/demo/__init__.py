"""`make up`: the local stack with ferry running on it and a sample Migration, for trying ferry out."""
