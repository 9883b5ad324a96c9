"""The PostgreSQL data driver: freeze the source, snapshot it to S3, restore into the target, verify.

`activities.PostgresActivities` holds the five activities the saga calls as
`postgresql.<operation>`; the other modules each do one part of the work.
"""
