print 'hello'  # expect: PF300
