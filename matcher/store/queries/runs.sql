-- name: position_of
SELECT "position" FROM matcher.runs WHERE tenant = %(tenant)s AND run_id = %(run_id)s;
