"""The worked examples of seed 002 (002_3903d6a2179b2f70.txt), verbatim: deltaflood and daystream lines, test vectors
of test_log_daystream.py and test_log_interchange.py."""

# copied from the seed document (not part of the repository, so no test reads it): every example line of it is here.
DELTAFLOOD = [
    "_table\tzzz\t_xid\t88628916\t_action\tdelete\ta\tfox61\t\t",
    "_table\tzzz\t_xid\t88628916\t_action\treplace\ta\tfox49\t\t",
    "_table\tzzz\t_xid\t88628916\t_action\tupdate\ta\tfox61\tb\then62",
    "_table\tzzz\t_xid\t88628917\t_action\tupdate\ta\tfox17\tb\then60",
    "_table\tzzz\t_xid\t88628918\t_action\tinsert\ta\tfox62\tb\then17",
    "_table\tzzz\t_xid\t88628919\t_action\tupdate\ta\tfox99\tb\then38",
    "_table\tzzz\t_xid\t88628920\t_action\tdelete\ta\tfox54\t\t",
    "_table\tzzz\t_xid\t88628920\t_action\treplace\ta\tfox11\t\t",
    "_table\tzzz\t_xid\t88628920\t_action\tupdate\ta\tfox54\tb\then93",
    "_table\tzzz\t_xid\t88628921\t_action\tupdate\ta\tfox24\tb\then78",
    "_table\tzzz\t_xid\t88628922\t_action\tupdate\ta\tfox68\tb\then76",
    "_table\tzzz\t_xid\t88628923\t_action\tupdate\ta\tfox83\tb\then51",
]
DAYSTREAM = [
    "_c\t1507507200\t_s\t0\t_table\tzzz\t_xid\t88628908\t_action\tupdate\ta\tfox47\tb\then30",
    "_c\t1507507200\t_s\t1\t_table\tzzz\t_xid\t88628909\t_action\tupdate\ta\tfox97\tb\then11",
    "_c\t1507507200\t_s\t2\t_table\tzzz\t_xid\t88628910\t_action\tupdate\ta\tfox47\tb\then95",
    "_c\t1507507200\t_s\t3\t_table\tzzz\t_xid\t88628911\t_action\tupdate\ta\tfox97\tb\then38",
    "_c\t1507507200\t_s\t4\t_table\tzzz\t_xid\t88628912\t_action\tupdate\ta\tfox15\tb\then51",
    "_c\t1507507200\t_s\t5\t_table\tzzz\t_xid\t88628913\t_action\tupdate\ta\tfox7\tb\then94",
    "_c\t1507507200\t_s\t6\t_table\tzzz\t_xid\t88628914\t_action\tdelete\ta\tfox70\t\t",
    "_c\t1507507200\t_s\t7\t_table\tzzz\t_xid\t88628915\t_action\tupdate\ta\tfox53\tb\then83",
    "_c\t1507507200\t_s\t8\t_table\tzzz\t_xid\t88628916\t_action\tdelete\ta\tfox61\t\t",
    "_c\t1507507200\t_s\t9\t_table\tzzz\t_xid\t88628916\t_action\treplace\ta\tfox49\t\t",
    "_c\t1507507200\t_s\t10\t_table\tzzz\t_xid\t88628916\t_action\tupdate\ta\tfox61\tb\then62",
    "_c\t1507507200\t_s\t11\t_table\tzzz\t_xid\t88628917\t_action\tupdate\ta\tfox17\tb\then60",
    "_c\t1507507200\t_s\t12\t_table\tzzz\t_xid\t88628918\t_action\tinsert\ta\tfox62\tb\then17",
    "_c\t1507507200\t_s\t13\t_table\tzzz\t_xid\t88628919\t_action\tupdate\ta\tfox99\tb\then38",
    "_c\t1507507200\t_s\t14\t_table\tzzz\t_xid\t88628920\t_action\tdelete\ta\tfox54\t\t",
    "_c\t1507507200\t_s\t15\t_table\tzzz\t_xid\t88628920\t_action\treplace\ta\tfox11\t\t",
    "_c\t1507507200\t_s\t16\t_table\tzzz\t_xid\t88628920\t_action\tupdate\ta\tfox54\tb\then93",
    "_c\t1507507200\t_s\t17\t_table\tzzz\t_xid\t88628921\t_action\tupdate\ta\tfox24\tb\then78",
    "_c\t1507507201\t_s\t0\t_table\tzzz\t_xid\t88628922\t_action\tupdate\ta\tfox68\tb\then76",
    "_c\t1507507201\t_s\t1\t_table\tzzz\t_xid\t88628923\t_action\tupdate\ta\tfox83\tb\then51",
]
